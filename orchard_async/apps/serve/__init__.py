"""Service mode: sandboxes over HTTP, in the API of Orchard Env (``orchard-async serve``).

``create_app(adapter, keys=...)`` is the aiohttp application; ``cli.add_serve_command``
the command. The ``remote`` adapter (``orchard_async.adapters.remote``) is its client.
"""

from orchard_async.apps.serve.app import create_app
from orchard_async.apps.serve.keys import KeyStore, Tenant, hash_key, load_keys

__all__ = ["KeyStore", "Tenant", "create_app", "hash_key", "load_keys"]
