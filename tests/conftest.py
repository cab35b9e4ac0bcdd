"""Test-wide settings."""

from hypothesis import settings

# Timing is not what the property tests assert, and CI runs on a shared, noisy 2-core machine:
# hypothesis's default 200 ms per-example deadline would fail correct code that was merely slow.
settings.register_profile("relay", deadline=None)
settings.load_profile("relay")
