# the one place the version is written: setup.py reads this line, the package imports it
__version__ = "0.2.0"
