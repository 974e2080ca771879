"""ipywidgets explorers: sliders that redraw plots live.

One module per explorer. Each has a plain ``render_*`` function that takes the slider
values and returns what to show (it never raises: an impossible combination returns a
message in plain words), and an ``*_explorer()`` function that wires sliders to it.
Tests call the ``render_*`` functions for every reachable slider position.
"""
