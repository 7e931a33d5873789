#!/bin/sh
python3 -c "import os, urllib.request; open('/app/fetched.txt', 'wb').write(urllib.request.urlopen(os.environ['SERVER_URL'], timeout=10).read())"
