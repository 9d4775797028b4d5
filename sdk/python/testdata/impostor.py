"""A Python plugin installed as fp-plugin-pyimpostor that says it is somebody else."""

import taskhost_plugin as th

plugin = th.Plugin("somebody_else")

if __name__ == "__main__":
    plugin.serve()
