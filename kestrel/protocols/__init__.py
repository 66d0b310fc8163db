"""Wire protocols: thin translators between bytes and a per-connection ClientSession."""
