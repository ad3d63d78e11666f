"""The installed taxmodel's version, in a module of its own so that what stamps outputs with it
(reports, traces, baselines) does not import the package root."""
__version__ = "0.1.0"
