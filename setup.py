"""For the tools and habits that still look for a ``setup.py`` (``python setup.py
--version``, older build scripts): it adds nothing. The package's name, version,
dependencies and contents are in ``pyproject.toml``, the one source of truth, which
setuptools reads when ``setup()`` is called with no arguments."""

from setuptools import setup

setup()
