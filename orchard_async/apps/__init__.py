"""The applications built on the library: the ``orchard-async`` command line, the HTTP service
(``serve/``) and the trajectory viewer (``view/``). Nothing in the layers imports them."""
