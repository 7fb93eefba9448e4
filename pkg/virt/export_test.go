package virt

// SetImageLockHooks sets the test seams of c's image locks (imageLocks):
// waiting runs when EnsureOverlay finds its base locked by a collection
// and is about to wait; deleting runs when DeleteUnusedImage found an
// image unused, its lock held, and is about to delete it. Set them before
// c is used for images.
func SetImageLockHooks(c *Client, waiting, deleting func(VolumeRef)) {
	c.images.waiting, c.images.deleting = waiting, deleting
}
