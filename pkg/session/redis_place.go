package session

import "context"

// placement is the input of a placement (see SlotStore).
type placement struct{}

func (r *RedisStore) placeCreate(ctx context.Context, m *mutation, s Session, old stored, prev *Session, p *placement) (bool, *Session, error) {
	panic("unreachable")
}
