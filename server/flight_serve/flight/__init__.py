"""flight_serve.flight"""
