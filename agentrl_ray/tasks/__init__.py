"""Built-in tasks: prompt datasets the project generates itself (no download)."""
