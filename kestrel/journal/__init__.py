"""The journal: Kestrel's on-disk record format, the periodic-sync file, and journal files."""
