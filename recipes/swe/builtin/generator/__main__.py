import sys

from orchard_async.recipes.swe.builtin.generator.gen import main

sys.exit(main())
