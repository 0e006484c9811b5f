"""Redraft the branch's migration: draft functions, strip flags, put the hand-written DDL on top."""
import pathlib, re, subprocess, sys
name = sys.argv[1]
mig = pathlib.Path("flowlane/core/migrations")
for old in mig.glob("0018_*.sql"):
    old.unlink()
subprocess.run([".venv/bin/python", "-m", "flowlane.core.draft_migration", name], check=True)
path = next(mig.glob("0018_*.sql"))
text = path.read_text()
head_end = text.index("\n\n") + 2
header = pathlib.Path(".scratch/header.txt").read_text()
body = text[head_end:]
body = re.sub(r"-- TO WRITE BY HAND:.*?(?=\n\n(?!--)|\Z)", "", body, flags=re.S).rstrip() + "\n"
hand = pathlib.Path(".scratch/handwritten.sql").read_text()
path.write_text(header + "\n" + hand + "\n" + body)
print(path)
