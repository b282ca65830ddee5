"""flight_serve.connectors"""
