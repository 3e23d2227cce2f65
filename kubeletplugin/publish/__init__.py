"""Publishing the node's ResourceSlices and keeping them published (:mod:`.publisher`)."""
