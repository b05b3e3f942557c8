"""``python -m fd_core.backends``: list installed backends and whether each is usable."""

from fd_core.backends.registry import format_listing, list_backends

if __name__ == "__main__":
    print(format_listing(list_backends()))
