"""A Python plugin that prints to stdout before it serves, where the host
expects the handshake."""

import taskhost_plugin as th

plugin = th.Plugin("pystdout")
print("hello from pystdout")

if __name__ == "__main__":
    plugin.serve()
