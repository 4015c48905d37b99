"""`agentrl-ray view`: a local web page over run folders (server.py: the app and the command; runs.py: reading a
run folder as it grows; static/: the page, with uPlot 1.6.32 vendored from npm)."""
