"""Generated protobuf code for schemas/ (make proto); never edited by hand."""
