// Command dra-oracle answers DRA cases with Kubernetes' own code: the structured allocator of
// k8s.io/dynamic-resource-allocation (with the feature set kube-scheduler 1.37 enables by
// default) and its CEL environment for device selectors.
//
// Input on stdin: a stream of JSON objects, one case each. Output on stdout: one JSON line per
// case, in input order, carrying the case's "id". A case is
//
//	{"id": "...", "kind": "cel", "expression": "...", "driver": "...", "device": {<Device>}}
//	{"id": "...", "kind": "allocate", "node": {<Node>}, "slices": [...], "classes": [...],
//	 "allocatedClaims": [...], "claims": [...], "sequence": false}
//
// A CEL answer has "compileError", or "value" (a bool) or "evalError". An allocation answer
// has "allocated": true with "results" (one AllocationResult per claim; absent for a case
// without claims), or "unsatisfiable": true, or "error" with
// "errorOnNode" telling whether it wraps ErrFailedAllocationOnNode. A case that does not
// decode gets "inputError".
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
)

// features is what kube-scheduler 1.37 passes with its default feature gates
// (DRAFractionalCapacityRange is on by default from 1.37; the alpha gates are off).
var features = structured.Features{
	AdminAccess:             true,
	PrioritizedList:         true,
	PartitionableDevices:    true,
	DeviceTaints:            true,
	DeviceBindingAndStatus:  true,
	ConsumableCapacity:      true,
	FractionalCapacityRange: true,
}

var celFeatures = cel.Features{EnableConsumableCapacity: true}

type oracleCase struct {
	ID   string `json:"id"`
	Kind string `json:"kind"`

	Expression string              `json:"expression"`
	Driver     string              `json:"driver"`
	Device     *resourceapi.Device `json:"device"`

	Node            *v1.Node                     `json:"node"`
	Slices          []*resourceapi.ResourceSlice `json:"slices"`
	Classes         []*resourceapi.DeviceClass   `json:"classes"`
	AllocatedClaims []*resourceapi.ResourceClaim `json:"allocatedClaims"`
	Claims          []*resourceapi.ResourceClaim `json:"claims"`
	// Sequence: allocate the claims one after another, each seeing the last ones' results.
	Sequence bool `json:"sequence"`
}

type answer struct {
	ID string `json:"id"`

	CompileError *string `json:"compileError,omitempty"`
	Value        *bool   `json:"value,omitempty"`
	EvalError    *string `json:"evalError,omitempty"`

	Results       []resourceapi.AllocationResult `json:"results,omitempty"`
	Allocated     bool                           `json:"allocated,omitempty"`
	Unsatisfiable bool                           `json:"unsatisfiable,omitempty"`
	Error         *string                        `json:"error,omitempty"`
	ErrorOnNode   bool                           `json:"errorOnNode,omitempty"`

	InputError *string `json:"inputError,omitempty"`
	// TimedOut: the allocation ran past caseTimeout (kube-scheduler would give up too).
	TimedOut bool `json:"timedOut,omitempty"`
}

// caseTimeout bounds one allocation, as kube-scheduler bounds its scheduling cycle.
const caseTimeout = 60 * time.Second

type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(l))
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

// allocatedState counts what allocated claims hold as kube-scheduler does: admin access holds
// nothing, a result with a share ID is one share and its consumed capacity, any other result
// holds the whole device.
func allocatedState(claims []*resourceapi.ResourceClaim) structured.AllocatedState {
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, claim := range claims {
		if claim == nil || claim.Status.Allocation == nil {
			continue
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			if ptr.Deref(r.AdminAccess, false) {
				continue
			}
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if r.ShareID != nil {
				state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
				if r.ConsumedCapacity != nil {
					state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
				}
				continue
			}
			state.AllocatedDevices.Insert(id)
		}
	}
	return state
}

func answerCEL(ctx context.Context, cache *cel.Cache, c *oracleCase) answer {
	out := answer{ID: c.ID}
	result := cache.GetOrCompile(c.Expression)
	if result.Error != nil {
		msg := result.Error.Error()
		out.CompileError = &msg
		return out
	}
	device := c.Device
	if device == nil {
		device = &resourceapi.Device{}
	}
	value, _, err := result.DeviceMatches(ctx, cel.Device{
		Driver:                   c.Driver,
		AllowMultipleAllocations: device.AllowMultipleAllocations,
		Attributes:               device.Attributes,
		Capacity:                 device.Capacity,
	})
	if err != nil {
		msg := err.Error()
		out.EvalError = &msg
		return out
	}
	out.Value = &value
	return out
}

func answerAllocate(ctx context.Context, cache *cel.Cache, c *oracleCase) answer {
	out := answer{ID: c.ID}
	classes := classLister{}
	for _, class := range c.Classes {
		classes[class.Name] = class
	}
	node := c.Node
	if node == nil {
		node = &v1.Node{}
	}
	fail := func(err error) answer {
		msg := err.Error()
		out.Error = &msg
		out.ErrorOnNode = errors.Is(err, structured.ErrFailedAllocationOnNode)
		return out
	}
	bounded, cancel := context.WithTimeout(ctx, caseTimeout)
	defer cancel()
	// One pod's claims jointly, or (sequence) each claim on its own, seeing the ones before.
	groups := [][]*resourceapi.ResourceClaim{c.Claims}
	if c.Sequence {
		groups = groups[:0]
		for _, claim := range c.Claims {
			groups = append(groups, []*resourceapi.ResourceClaim{claim})
		}
	}
	held := append([]*resourceapi.ResourceClaim{}, c.AllocatedClaims...)
	var results []resourceapi.AllocationResult
	for _, group := range groups {
		allocator, err := structured.NewAllocator(ctx, features, allocatedState(held), classes, c.Slices, cache)
		if err != nil {
			return fail(err)
		}
		got, err := allocator.Allocate(bounded, node, group)
		if err != nil {
			if bounded.Err() != nil {
				return answer{ID: c.ID, TimedOut: true}
			}
			return fail(err)
		}
		if got == nil {
			out.Unsatisfiable = true
			return out
		}
		results = append(results, got...)
		for i, claim := range group {
			done := claim.DeepCopy()
			done.Status.Allocation = &got[i]
			held = append(held, done)
		}
	}
	out.Results = results
	out.Allocated = true
	return out
}

// answerCase answers one case; a panic in upstream's code (which some inputs cause) becomes
// that case's input error instead of ending the whole batch.
func answerCase(ctx context.Context, cache *cel.Cache, c *oracleCase) (a answer) {
	defer func() {
		if r := recover(); r != nil {
			msg := fmt.Sprintf("upstream panicked: %v", r)
			a = answer{ID: c.ID, InputError: &msg}
		}
	}()
	switch c.Kind {
	case "cel":
		return answerCEL(ctx, cache, c)
	case "allocate":
		return answerAllocate(ctx, cache, c)
	default:
		msg := fmt.Sprintf("kind: %q is none of cel, allocate", c.Kind)
		return answer{ID: c.ID, InputError: &msg}
	}
}

func run(in io.Reader, w io.Writer) error {
	ctx := context.Background()
	cache := cel.NewCache(1000, celFeatures)
	decoder := json.NewDecoder(bufio.NewReaderSize(in, 1<<20))
	out := bufio.NewWriter(w)
	defer out.Flush()
	encoder := json.NewEncoder(out)
	encoder.SetEscapeHTML(false)
	for {
		var raw json.RawMessage
		if err := decoder.Decode(&raw); err == io.EOF {
			return nil
		} else if err != nil {
			return fmt.Errorf("reading a case: %w", err)
		}
		var c oracleCase
		var a answer
		if err := json.Unmarshal(raw, &c); err != nil {
			msg := err.Error()
			a = answer{ID: c.ID, InputError: &msg}
		} else {
			a = answerCase(ctx, cache, &c)
		}
		if err := encoder.Encode(&a); err != nil {
			return err
		}
	}
}

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "dra-oracle:", err)
		os.Exit(1)
	}
}
