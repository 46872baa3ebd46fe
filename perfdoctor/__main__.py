from perfdoctor.console import entry

entry()
