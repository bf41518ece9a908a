"""fedfdp."""
