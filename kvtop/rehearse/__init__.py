"""``kvtop rehearse``: a go-live rehearsal. Drive load (kvtop.load), watch the server and
the GPUs with the app's own poller, trackers and leak detector, judge three criteria and
write a report (docs/rehearse.md)."""
