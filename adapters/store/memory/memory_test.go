package memory_test

import (
	"testing"

	"iop/adapters/store/memory"
	"iop/adapters/store/storetest"
	"iop/ports"
)

func TestRunStoreContract(t *testing.T) {
	storetest.RunStoreContract(t, func(*testing.T) ports.RunStore { return memory.NewRunStore() })
}

func TestChatStoreContract(t *testing.T) {
	storetest.ChatStoreContract(t, func(*testing.T) ports.ChatSessionStore { return memory.NewChatStore() })
}

func TestAgentSessionStoreContract(t *testing.T) {
	storetest.AgentSessionStoreContract(t, func(*testing.T) ports.AgentSessionStore { return memory.NewAgentSessionStore() })
}
