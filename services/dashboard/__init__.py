"""The learner metrics dashboard: a standard-library HTTP server and a vendored uPlot page."""
