"""Generated protobuf code (make proto); never edited by hand."""
