"""Long Range Arena configs (one file per task)."""
