"""Demonstrations that run on real worker processes (``justonce demo …``)."""
