// gomemcache (Debian's golang-github-bradfitz-gomemcache-dev) driven by the
// matrix: reads driver-protocol requests on stdin (see tests/clients/driver.py),
// answers one line each. Usage: driver HOST PORT
package main

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

func unhex(s string) string {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func answer(mc *memcache.Client, op string, args []string) string {
	var err error
	switch op {
	case "set":
		err = mc.Set(&memcache.Item{Key: unhex(args[0]), Value: []byte(unhex(args[1]))})
	case "get":
		item, getErr := mc.Get(unhex(args[0]))
		if getErr == memcache.ErrCacheMiss {
			return "none"
		} else if getErr != nil {
			err = getErr
		} else {
			return "value " + hex.EncodeToString(item.Value)
		}
	case "delete":
		err = mc.Delete(unhex(args[0]))
	case "flush_all":
		err = mc.FlushAll()
	case "quit":
	default:
		return "error unknown request " + op
	}
	if err != nil {
		return "error " + strings.ReplaceAll(err.Error(), "\n", " ")
	}
	return "ok"
}

func main() {
	mc := memcache.New(os.Args[1] + ":" + os.Args[2])
	// The default is 100 ms: a get q/t=300 would be cut short.
	mc.Timeout = 10 * time.Second
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		fields := strings.Split(in.Text(), " ")
		fmt.Println(answer(mc, fields[0], fields[1:]))
		if fields[0] == "quit" {
			return
		}
	}
}
