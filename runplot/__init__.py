"""A picture of an ``elastic-run`` job from its events file (``--events``).

    python -m runplot run.jsonl -o run.svg      (or: elastic-plot run.jsonl -o run.png)

``runplot.timeline`` turns the events into series and markers (pure, no dependency);
``runplot.render`` draws them with matplotlib, the optional ``plot`` extra. The event
vocabulary (kinds and fields) is ``driver.events``; this package only reads the file.
"""
