"""cs336_systems: the library behind the CS336 assignment 2 report workbook."""

__version__ = "0.1.0"
