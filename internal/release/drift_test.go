package release
