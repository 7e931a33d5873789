from pathlib import Path

answer = Path("/app/answer.txt")
assert answer.is_file(), "no answer.txt"
assert answer.read_text().strip() == "38", answer.read_text()
