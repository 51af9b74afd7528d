//go:build !linux

package transport

import (
	"errors"
	"net"
)

// Shared memory between same-host peers is implemented on Linux only
// (shm_linux.go); elsewhere every connection is plain TCP.

const DefaultSharedMemoryRing = 2 << 20

const (
	minSharedMemoryRing = 64 << 10
	maxSharedMemoryRing = 256 << 20
	shmTagLen           = 16
)

type shmSegment struct{ path string }

type shmConn struct{ net.Conn }

var errNoShm = errors.New("shared memory between peers is implemented on Linux only")

func sameHost(*net.TCPConn) bool                                        { return false }
func createSegment(int) (*shmSegment, []byte, error)                    { return nil, nil, errNoShm }
func openSegment(string, int, []byte) (*shmSegment, error)              { return nil, errNoShm }
func (s *shmSegment) unlink()                                           {}
func (s *shmSegment) unmap()                                            {}
func sharedConn(*rawSocket, *shmSegment, int, string) (*shmConn, error) { return nil, errNoShm }

func (c *shmConn) writev([][]byte) (int64, error) { return 0, errNoShm }
