"""`relay serve`: trained policies behind Ray Serve (service.py holds the Ray-free logic)."""
