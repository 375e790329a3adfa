"""What kvtop writes for programs: the JSON contracts (snapshot, rules) and how a document
is printed or saved."""
