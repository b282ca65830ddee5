"""flight_serve.engine"""
