"""flight_serve.store"""
