"""The release of torch-autotune, on the ground floor so that any module can name it without
importing the package's front door (which imports nearly everything)."""

__version__ = "0.1.0"
