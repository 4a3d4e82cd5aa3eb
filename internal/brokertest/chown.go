package brokertest

import (
	"os"
	"os/user"
	"strconv"
)

// chownToRabbit gives dir to the rabbitmq user when running as root: the
// server script then switches to that user, which must own the node's
// directory.
func chownToRabbit(dir string) error {
	if os.Getuid() != 0 {
		return nil
	}
	u, err := user.Lookup("rabbitmq")
	if err != nil {
		return nil
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return os.Chown(dir, uid, gid)
}
