"""A ring member's connections to its peers: the data-plane listener a worker opens once
at init and the dialer that reaches another one (``listener``), the four connections to
both neighbours made for each round (``links``), and the thread that notices a lost
neighbour from them whatever the main thread is doing (``monitor``).
"""
