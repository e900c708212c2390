"""The HTTP service: ``justonce serve`` (see app.py). Thin: routes over the App."""
