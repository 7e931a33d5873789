from types import SimpleNamespace

import yaml


class TaskDefinition(SimpleNamespace):
    @classmethod
    def from_yaml(cls, path):
        with open(path) as f:
            return cls(**yaml.safe_load(f))
