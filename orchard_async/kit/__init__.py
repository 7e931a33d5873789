"""The adapter author's kit: the framed shell protocol and its client, ``ShellSandbox`` (a shell
client turned into the ``Sandbox`` contract), byte streams, background work, ``orchard.*`` labels,
the one /proc reader (``procfs``), the one retry policy (``retry``), and the container shell
shared by docker and kubernetes. Never imports the engine."""
