"""Generated protobuf code for schemas/flight_serve (make proto); never edited by hand."""
