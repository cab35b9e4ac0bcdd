"""`relay sweep`: many relay runs as Ray Tune trials (searches, ASHA, PBT)."""
