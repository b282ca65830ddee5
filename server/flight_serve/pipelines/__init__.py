"""flight_serve.pipelines"""
