from dataclasses import dataclass


@dataclass
class Message:
    role: str
    content: str

    @property
    def text(self):
        return self.content
