import sys

from agentrl_ray.cli import main

sys.exit(main())
