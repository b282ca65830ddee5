"""Generated protobuf code for schemas/flight_serve/v1 (make proto); never edited by hand."""
