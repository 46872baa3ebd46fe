from perfdoctor.cli import entry

entry()
