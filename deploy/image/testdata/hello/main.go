// Command hello stands in for Bulkhead's binaries in the image tests: a
// small static Go binary of the test's Go release.
package main

import "fmt"

func main() { fmt.Println("hello") }
