import sys

from pearl.cli import main

sys.exit(main())
