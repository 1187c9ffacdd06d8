"""The live dashboard: a read-only web page of the status report (``python -m asynccoord dashboard``).

:mod:`.feed` turns status snapshots into the page's state and a stream of changes; :mod:`.app`
serves the page, its static files (the chart library uPlot is shipped in ``static/``) and the
stream, with aiohttp (the optional extra ``dashboard``). Importing this package needs no extra;
importing :mod:`.app` needs aiohttp.
"""
