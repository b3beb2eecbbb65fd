"""``python -m dssync.launch.emulate.agent --name NAME [ssh options] HOST COMMAND...``: the
remote shell through which mpirun and horovodrun reach the emulated workers (``launchers``)."""

import sys

from .launchers import agent_main

if __name__ == "__main__":
    sys.exit(agent_main(sys.argv[1:]))
