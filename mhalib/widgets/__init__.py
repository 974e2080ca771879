"""ipywidgets explorers: sliders that redraw plots live.

One module per explorer:

* ``mhalib.widgets.mha``: H and d_model (notebook 02): shape trace, d_head, parameter
  count, one heatmap per head; and a step-through view of one forward pass.
* ``mhalib.widgets.kv``: context length and KV heads (notebook 06): cache bytes for
  real models.
* ``mhalib.widgets.gqa``: H and g (notebook 07): which query heads share which K/V
  head, and what the cache costs.
* ``mhalib.widgets.tradeoff``: g, latent size and window (notebook 10): where a configuration
  sits among the measured variants, quality against cache bytes, with the frontier.
* ``mhalib.widgets.common``: what they share (a safe render wrapper, sliders, the
  layout and CSS classes the browser tests look for).

Each has a plain ``render_*`` function that takes the slider values and returns what
to show (it never raises: an impossible combination returns a message in plain words),
and an ``*_explorer()`` function that wires sliders to it. Tests call the ``render_*``
functions for every reachable slider position.
"""
